"""A store call's pipeline, shared by every store type, in the order a call
meets it: its arguments normalised (:mod:`.args`), validated before anything
changes (:mod:`.validate`), Ctrl-C held while it must finish whole
(:mod:`.interrupts`), its events reported (:mod:`.reporting`), and the
updater or optimizer applied to what it pushed (:mod:`.updating`)."""
