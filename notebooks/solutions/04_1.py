# Notebook 04, exercise 1: one solution (it uses the notebook's names).
# A value of at least bigarray_bound elements is cut into 2 slices, [0, n // 2) on server 0
# and the rest on server 1; a smaller one lives whole on server (key * 9973) % 2.
def on_server_1(key, rows, cols):
    n = rows * cols
    if n >= 10_000:
        return n - n // 2
    return n if (key * 9973) % 2 == 1 else 0


print("a (300, 50) key:", on_server_1(7, 300, 50), "elements on server 1")
