"""Where profiles come from: measured on a torch model (:mod:`.measured`, imports torch),
built from formulas (:mod:`.analytic`) or imported from other tools (:mod:`.imported`)."""
