"""Who calls the service: API keys (those of the environment and run-time key records), OAuth access tokens, and
the limits of every owner."""
