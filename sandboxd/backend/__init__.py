"""Container-engine backends behind the :class:`~sandboxd.backend.base.Backend` protocol."""
