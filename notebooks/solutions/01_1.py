# Notebook 01, exercise 1: one solution (it uses the notebook's names).
kv1 = labkv.create("local")
kv1.init("w", labkv.zeros(4))
kv1.push("w", [labkv.full(4, i + 1.0, device=d) for i, d in enumerate(labkv.devices(3))])
answer1 = kv1.pull("w")
