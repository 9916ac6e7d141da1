# Notebook 03, exercise 1: one solution (it uses the notebook's names).
# The push: one value is copied into the stored array (read B, write B); n >= 2 values take
# n - 1 adds (the first reads two values, each further one reads the stored array and a
# value), each reading 2·B and writing B. The pull: n copies, each reading B and writing B.
def reducer_traffic(n, nbytes):
    push = 2 * nbytes if n == 1 else 3 * (n - 1) * nbytes
    pull = 2 * n * nbytes
    return push + pull
