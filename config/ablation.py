# The FP8 attention ablation: GPT-2 small (124M) at block_size 1024, no QK-norm (the setting where the
# paper reports the stale-delta gap), RoPE. `python ablation.py run` trains one arm per attention
# path and seed into out-ablation/<arm>/, which `python ablation.py plot` reads; by hand, one arm is
#   python train.py config/ablation.py --delta_monitor=True --attention=fp8 --seed=1337 --out_dir=out-ablation/fp8
# (ablation.py's ARMS: sdpa, fp8_stale and fp8 at seeds 1337, 2024 and 7).
# 65k tokens per step x 2000 steps = 131M tokens. --n_head=6 gives head dim 128 instead of 64.
out_dir = "out-ablation"
dataset = "builtin"
n_layer = 12
n_head = 12
n_embd = 768
block_size = 1024
qk_norm = False
pos = "rope"
batch_size = 16
gradient_accumulation_steps = 4
max_iters = 2000
eval_interval = 250
eval_tokens = 1048576
learning_rate = 6e-4
min_lr = 6e-5
warmup_iters = 200
