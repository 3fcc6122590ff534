"""Profiles imported from other tools' files: PipeDream's ``graph.txt`` (:mod:`.pipedream`)."""
