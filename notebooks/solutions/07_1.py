# Notebook 07, exercise 1: one solution (it uses the notebook's names).
# The model is 64*64 + 64 + 64*10 + 10 = 4810 float32 values: 19240 bytes a push or a pull.
# Each rank takes ceil(1400 / (2 * 32)) = 22 steps (the last one padded), a pull and a push
# each, and pulls the model once before the epoch and once after it.
model_bytes = sum(int(np.prod(shape)) for shape in SHAPES.values()) * 4
steps = -(-len(X_train) // (W * 32))
answer1 = (W * steps * model_bytes, W * (steps + 2) * model_bytes)
