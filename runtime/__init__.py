"""The worker's internals: settings, payload codec and storage, the sandbox."""
