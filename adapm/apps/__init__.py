"""Native training apps: python -m adapm.apps.kge, adapm.apps.wv (and mf later)."""
