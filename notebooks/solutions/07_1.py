# Notebook 07, exercise 1: one solution (it uses the notebook's names).
kv = labkv.create("dist_sync", cluster=handle, num_servers=1)
kv.init(NAMES, [initial_weights()[n] for n in NAMES])
kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.2, rescale_grad=1.0 / W))
answer1 = run(train, num_workers=W, kvstore=kv, args=(data, 2))[0][-1]
kv.close()
