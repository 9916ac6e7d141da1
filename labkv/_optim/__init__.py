"""The optimizers' internals: the base class and registry behind
:mod:`labkv.optimizers` (:mod:`.optimizer_base`), and their saved states
(:mod:`.optimizer_states`, written as npz + JSON by :mod:`.statefile`)."""
