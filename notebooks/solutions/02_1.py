# Notebook 02, exercise 1: one solution (it uses the notebook's names).
ex = labkv.create("local")
ex.init(0, labkv.zeros(1))
ex.set_optimizer(labkv.optimizers.SGD(learning_rate=0.1, momentum=0.9))
for _ in range(3):
    ex.push(0, labkv.ones(1))
answer1 = ex.pull(0)
