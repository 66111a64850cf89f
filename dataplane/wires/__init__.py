"""The two wires the data plane speaks: what each serves, how it fails, how a stream ends."""
