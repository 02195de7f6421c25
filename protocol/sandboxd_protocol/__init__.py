"""The sandboxd.v1 wire contract, shared by the daemon and its clients.

``v1`` holds the generated stubs, ``limits`` the request bounds, ``redact`` the
streaming secret masker, ``paths`` the default socket location, ``retry`` the retry
policy both sides use.
"""
