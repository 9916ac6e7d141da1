# Notebook 01, exercise 1: one solution (it uses the notebook's names).
# Without an updater a push replaces the stored value by the sum of its devices' values:
# only the last push counts, and all of its devices count.
def predict_pull(pushes):
    return sum(pushes[-1])


# The tutorial's case, on a store: 3 devices push 1, 2 and 3.
kv1 = labkv.create("local")
kv1.init("w", labkv.zeros(4))
kv1.push("w", [labkv.full(4, i + 1.0, device=d) for i, d in enumerate(labkv.devices(3))])
print("a pull gives", kv1.pull("w"), "- predicted", predict_pull([[1, 2, 3]]))
