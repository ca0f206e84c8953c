# GPT-2 small (124M) on FineWeb 10B (first: python data/fineweb/prepare.py --train_shards=103), nanoGPT's
# recipe: 0.5M tokens per step, 10B tokens in 19,073 steps. Meant for 8 GPUs:
#   torchrun --standalone --nproc_per_node=8 train.py config/fineweb.py
out_dir = "out-fineweb"
dataset = "fineweb10B"
n_layer = 12
n_head = 12
n_embd = 768
block_size = 1024
batch_size = 16
gradient_accumulation_steps = 32  # 16 x 1024 x 32 = 524,288 tokens per step, over all GPUs
max_iters = 19073
eval_interval = 500
eval_tokens = 10485760
learning_rate = 6e-4
min_lr = 6e-5
warmup_iters = 700
