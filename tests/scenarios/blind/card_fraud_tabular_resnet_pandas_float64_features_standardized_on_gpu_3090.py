"""Card-fraud tabular ResNet: the whole feature matrix goes to the GPU as float64, then is standardized there.
One RTX 3090 (24 GiB).

The real code (train_fraud_mlp.py), written after a Kaggle notebook whose data was 300k rows:

    df = pd.read_parquet("transactions_2024q3_features.parquet")       # 9.5M rows, 240 engineered features
    X_train = torch.tensor(df[FEATURES].values, device="cuda")         # numpy float64 -> torch.float64
    y_train = torch.tensor(df["is_fraud"].values, device="cuda")
    mu, sigma = X_train.mean(0), X_train.std(0)
    X_train = (X_train - mu) / (sigma + 1e-6)                          # <- OOM
    ... then a TabularResNet (240 -> 512 x 4 blocks, 1.6M parameters) trained with batches X_train[idx]

pandas hands torch float64 (its default), and torch.tensor keeps it: 9,500,000 x 240 x 8 B = 18.24 GB
(16.99 GiB) of features, plus the labels (76 MB), on a card of 24 GiB of which the context takes ~0.5.
`X_train - mu` makes a second tensor of the same 16.99 GiB while the first is still alive; 6.4 GiB are free.
The model has not even been built: no weights, no optimizer, no activations are involved.
What an expert says first: the dataset does not belong on the GPU whole, and not as float64.  Keep the frame on
the CPU (a TensorDataset / DataLoader with pin_memory, moving each batch of 4096 rows, 7.9 MB, to the GPU),
and cast to float32 (.astype(np.float32): half the bytes, and the model is float32 anyway); standardizing in
place (X_train.sub_(mu).div_(sigma)) would also avoid the second copy.  Wrong advice: smaller batch, mixed
precision, gradient checkpointing, FSDP, flash attention (no model has run), expandable_segments or
empty_cache (nothing is cached: one live 17 GiB tensor asks for a second one), a bigger card.
"""
import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

PARQUET = "transactions_2024q3_features.parquet"
N_ROWS = 9_500_000
N_FEATURES = 240
BATCH_SIZE = 4096
HIDDEN = 512
N_BLOCKS = 4
DEVICE = "cuda"


def read_features(path):
    """pd.read_parquet(path) -> (df[FEATURES].values, df["is_fraud"].values) on the GPU: torch.tensor keeps
    numpy's float64."""
    X = torch.empty(N_ROWS * N_FEATURES, dtype=torch.float64, device=DEVICE)
    y = torch.empty(N_ROWS, dtype=torch.float64, device=DEVICE)
    return X, y


def column_stats(X):
    mu = torch.empty(N_FEATURES, dtype=torch.float64, device=DEVICE)          # X.mean(0)
    sigma = torch.empty(N_FEATURES, dtype=torch.float64, device=DEVICE)       # X.std(0)
    return mu, sigma


def standardize(X, mu, sigma):
    centered = torch.empty(X.nbytes // 8, dtype=torch.float64, device=DEVICE)    # X - mu
    scaled = torch.empty(X.nbytes // 8, dtype=torch.float64, device=DEVICE)      # ... / (sigma + 1e-6)
    del centered
    return scaled


class ResidualBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.linear_1 = nn.Parameter(torch.empty(d * d, dtype=torch.float32, device=DEVICE))
        self.linear_2 = nn.Parameter(torch.empty(d * d, dtype=torch.float32, device=DEVICE))

    def forward(self, x, batch_size):
        h = torch.empty(batch_size * HIDDEN, dtype=torch.float32, device=DEVICE)
        h._saved = x
        return h


class TabularResNet(nn.Module):
    def __init__(self, n_features):
        super().__init__()
        self.first = nn.Parameter(torch.empty(n_features * HIDDEN, dtype=torch.float32, device=DEVICE))
        self.block_0 = ResidualBlock(HIDDEN)
        self.block_1 = ResidualBlock(HIDDEN)
        self.block_2 = ResidualBlock(HIDDEN)
        self.block_3 = ResidualBlock(HIDDEN)
        self.head = nn.Parameter(torch.empty(HIDDEN, dtype=torch.float32, device=DEVICE))

    def forward(self, x, batch_size):
        h = torch.empty(batch_size * HIDDEN, dtype=torch.float32, device=DEVICE)
        h._saved = x
        for block in (self.block_0, self.block_1, self.block_2, self.block_3):
            h = block(h, batch_size)
        return h


def main():
    X_train, y_train = read_features(PARQUET)
    print("loaded %d rows x %d features" % (N_ROWS, N_FEATURES))
    mu, sigma = column_stats(X_train)
    X_train = standardize(X_train, mu, sigma)
    model = TabularResNet(N_FEATURES)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(10):
        for start in range(0, N_ROWS, BATCH_SIZE):
            xb = torch.empty(BATCH_SIZE * N_FEATURES, dtype=torch.float32, device=DEVICE)   # X_train[idx].float()
            out = model(xb, BATCH_SIZE)
            loss = out            # BCEWithLogits(out, y_train[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    try:
        main()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
