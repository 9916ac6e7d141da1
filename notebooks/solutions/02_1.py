# Notebook 02, exercise 1: one solution (it uses the notebook's names).
# MXNet's SGD with momentum: mom = momentum * mom - lr * g, then w += mom, once per push.
def momentum_weight(grads):
    mom = w = 0.0
    for g in grads:
        mom = 0.9 * mom - 0.1 * g
        w += mom
    return w


# Three pushes of 1, on a store.
ex = labkv.create("local")
ex.init(0, labkv.zeros(1))
ex.set_optimizer(labkv.optimizers.SGD(learning_rate=0.1, momentum=0.9))
for _ in range(3):
    ex.push(0, labkv.ones(1))
print("a pull gives", ex.pull(0), "- predicted", momentum_weight([1, 1, 1]))
