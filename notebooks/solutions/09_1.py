# Notebook 09, exercise 1: one solution (it uses the notebook's names).
# S servers dealt in turn to n workers: worker i gets servers i, i + n, i + 2n, ...
def servers_per_worker(S, n):
    return [len(range(i, S, n)) for i in range(n)]


print("3 servers on the 2 workers:", servers_per_worker(3, 2))
