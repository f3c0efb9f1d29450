"""gateway: verified, deduplicated inbound events, a priority pipeline and a durable push feed."""
__version__ = "0.1.0"
