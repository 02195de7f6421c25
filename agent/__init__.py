"""The in-container agent's Go sources, shipped with the daemon (``sandboxd_agent``), which builds them."""
