"""leasehold-dataplane: the hot path — authenticate, admit, forward, relay, finish."""
