# Notebook 05, exercise 1: one solution (it uses the notebook's names).
ex = make_store("dist_async")
run(worker_loop, num_workers=W, kvstore=ex, args=(10,))
answer1 = float(ex.pull("state")[0])
ex.close()
