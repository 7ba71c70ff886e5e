"""The templates' networks (torch). Each takes a batch of rows ``[N, D]`` (already standardised) and returns
``[N, outputs]``; sequence and image templates reshape the row themselves, so every template's model has the
same input: one FP32 vector per example."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU, "sigmoid": nn.Sigmoid}


def _mlp(inputs: int, outputs: int, h: dict[str, Any]) -> nn.Sequential:
    layers: list[nn.Module] = []
    width = inputs
    for _ in range(h["layers"]):
        layers += [nn.Linear(width, h["units"]), ACTIVATIONS[h["activation"]]()]
        if h["dropout"]:
            layers.append(nn.Dropout(h["dropout"]))
        width = h["units"]
    layers.append(nn.Linear(width, outputs))
    return nn.Sequential(*layers)


class WideDeep(nn.Module):
    def __init__(self, inputs: int, outputs: int, h: dict[str, Any]) -> None:
        super().__init__()
        self.wide = nn.Linear(inputs, outputs)
        self.deep = _mlp(inputs, outputs, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wide(x) + self.deep(x)


class Conv(nn.Module):
    """``dims`` 1: rows of T*C values as [C, T]; 2: rows of C*H*W values as [C, H, W], pooled 2x2 per layer."""

    def __init__(self, inputs: int, outputs: int, h: dict[str, Any], dims: int) -> None:
        super().__init__()
        channels = h["channels"]
        if dims == 1:
            if inputs % channels:
                raise ValueError(f"cnn1d: a row has {inputs} values, not a multiple of channels ({channels})")
            self.shape = [channels, inputs // channels]
        else:
            want = channels * h["height"] * h["width"]
            if inputs != want:
                raise ValueError(
                    f"cnn2d: a row has {inputs} values, but channels*height*width is "
                    f"{channels}*{h['height']}*{h['width']} = {want}"
                )
            self.shape = [channels, h["height"], h["width"]]
        conv = nn.Conv1d if dims == 1 else nn.Conv2d
        act = ACTIVATIONS[h["activation"]]
        blocks: list[nn.Module] = []
        width, size = channels, min(self.shape[1:])
        for _ in range(h["layers"]):
            blocks += [conv(width, h["filters"], h["kernel_size"], padding=h["kernel_size"] // 2), act()]
            if dims == 2 and size >= 2:
                blocks.append(nn.MaxPool2d(2))
                size //= 2
            width = h["filters"]
        pool = nn.AdaptiveMaxPool1d(1) if dims == 1 else nn.AdaptiveAvgPool2d(1)
        self.features = nn.Sequential(*blocks, pool, nn.Flatten())
        head: list[nn.Module] = [nn.Linear(width, h["units"]), act()]
        if h["dropout"]:
            head.append(nn.Dropout(h["dropout"]))
        self.head = nn.Sequential(*head, nn.Linear(h["units"], outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x.reshape([-1, *self.shape])))


class Recurrent(nn.Module):
    """Rows of T*F values as T steps of F features; the last step's hidden state (both directions) decides."""

    def __init__(self, inputs: int, outputs: int, h: dict[str, Any], lstm: bool) -> None:
        super().__init__()
        features = h["features"]
        if inputs % features:
            raise ValueError(f"a row has {inputs} values, not a multiple of features ({features})")
        self.features = features
        cell = nn.LSTM if lstm else nn.RNN
        self.rnn = cell(
            features,
            h["units"],
            num_layers=h["layers"],
            batch_first=True,
            bidirectional=h["bidirectional"],
            dropout=h["dropout"] if h["layers"] > 1 else 0.0,
        )
        self.drop = nn.Dropout(h["dropout"])
        self.out = nn.Linear(h["units"] * (2 if h["bidirectional"] else 1), outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq, _ = self.rnn(x.reshape([x.shape[0], -1, self.features]))
        return self.out(self.drop(seq[:, -1, :]))


def build(template: str, inputs: int, outputs: int, h: dict[str, Any]) -> nn.Module:
    """The network of ``template`` for rows of ``inputs`` values and ``outputs`` outputs (classes or 1)."""
    if template == "mlp":
        return _mlp(inputs, outputs, h)
    if template == "logreg":
        return nn.Linear(inputs, outputs)
    if template == "wide-deep":
        return WideDeep(inputs, outputs, h)
    if template in ("cnn1d", "cnn2d"):
        return Conv(inputs, outputs, h, 1 if template == "cnn1d" else 2)
    if template in ("rnn", "lstm"):
        return Recurrent(inputs, outputs, h, lstm=template == "lstm")
    raise ValueError(f"no network for template {template!r}")


class Classifier(nn.Module):
    """What is exported for classification: standardise, run the network; (probabilities, class index)."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, net: nn.Module, mean: torch.Tensor, std: torch.Tensor) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.net((features - self.mean) / self.std)
        probabilities = torch.softmax(logits, dim=1)
        return probabilities, torch.argmax(probabilities, dim=1)


class Regressor(nn.Module):
    """What is exported for regression: standardise, run the network, undo the target's scaling."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, net: nn.Module, mean: torch.Tensor, std: torch.Tensor, y_mean: float, y_std: float) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)
        self.y_mean = y_mean
        self.y_std = y_std

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net((features - self.mean) / self.std)[:, 0] * self.y_std + self.y_mean
