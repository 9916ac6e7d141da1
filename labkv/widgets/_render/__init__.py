"""The monitor's sections as strings: plain tables (:mod:`.tables`) rendered as text
for scripts, logs and tests (:mod:`.text`) or as escaped HTML (:mod:`.html`), with the
one formatting of numbers, bytes, keys, shapes and times (:mod:`.format`)."""
