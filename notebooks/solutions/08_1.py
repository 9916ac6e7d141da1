# Notebook 08, exercise 1: one solution (it uses the notebook's names).
# A fresh optimizer has no momentum yet: its first step is -learning_rate * gradient, whatever
# the momentum factor (mom = m * 0 - lr * g; w += mom).
def step_without_states(lr, m, g):
    return -lr * g


print("lr 0.1, momentum 0.9, gradient 1:", step_without_states(0.1, 0.9, 1.0))
