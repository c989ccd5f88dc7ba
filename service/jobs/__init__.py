"""Jobs: what a fill hands off, and how its end is told (:mod:`.webhooks`)."""
