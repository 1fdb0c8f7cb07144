"""Native training apps: python -m adapm.apps.kge (and wv, mf later)."""
