# A small GPT on Tiny Shakespeare, GPT-2 tokens (first: python data/shakespeare/prepare.py). One GPU, ~2 min.
# The set is tiny (300k train tokens), so dropout and a short run keep it from memorizing.
out_dir = "out-shakespeare"
dataset = "shakespeare"
n_layer = 6
n_head = 6  # head dim 64
n_embd = 384
block_size = 256
dropout = 0.2
batch_size = 64
gradient_accumulation_steps = 1
max_iters = 2000
eval_interval = 250
eval_tokens = 32768  # the val split holds ~36k tokens
learning_rate = 1e-3
min_lr = 1e-4
warmup_iters = 100
