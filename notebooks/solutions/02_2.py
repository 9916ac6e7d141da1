# Notebook 02, exercise 2: one solution (it uses the notebook's names).
ex = labkv.create("device")
ex.set_gradient_compression({"type": "2bit", "threshold": 0.5})
ex.init(0, labkv.zeros(1))
ex.set_updater(lambda key, merged, stored: stored.__iadd__(merged))
answer2 = 0
while float(ex.pull(0)[0]) == 0:
    ex.push(0, labkv.full(1, 0.2))
    answer2 += 1
