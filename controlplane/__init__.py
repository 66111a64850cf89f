"""leasehold-control: owns every decision and every file of the gateway."""
