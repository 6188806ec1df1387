"""Which engine serves a request's model: the router, the names models answer to."""
