# The CPU smoke test (applied by itself when `python train.py` finds no GPU): a ~7M-parameter GPT, most of
# it the GPT-2 embedding, on the built-in corpus. First losses within seconds, done in a few minutes.
n_layer = 4
n_head = 2  # head dim 64, one the fp8 kernel takes too
n_embd = 128
block_size = 128
batch_size = 8
gradient_accumulation_steps = 1
max_iters = 300
eval_interval = 100
eval_tokens = 8192
log_interval = 10
learning_rate = 2e-3
min_lr = 2e-4
warmup_iters = 20
compile = False  # torch.compile on CPU costs more warm-up than this run saves
