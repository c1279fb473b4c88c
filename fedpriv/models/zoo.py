"""Models used in the DP papers; built from the Hydra ``model`` group by name.

All models take float32 inputs and return logits of shape ``(B, num_classes)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from fedpriv.common.errors import ConfigError, check
from fedpriv.models.cifar import CifarCNN, WideResNet


class TanhCNN(nn.Module):
    """The small tanh CNN of DP-SGD papers for 28x28 images (Papernot et al. 2021, Table 9).

    conv 8x8 stride 2 (16 ch) -> maxpool 2 stride 1 -> conv 4x4 stride 2 (32 ch) ->
    maxpool 2 stride 1 -> fc 32 -> fc ``num_classes``, tanh activations. Input ``(B, 1, 28, 28)``.
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 1) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 16, 8, stride=2, padding=3),
            nn.Tanh(),
            nn.MaxPool2d(2, 1),
            nn.Conv2d(16, 32, 4, stride=2),
            nn.Tanh(),
            nn.MaxPool2d(2, 1),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(32 * 4 * 4, 32), nn.Tanh(), nn.Linear(32, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class MLP(nn.Module):
    """Fully connected network ``in_features -> hidden... -> num_classes`` with ReLU."""

    def __init__(
        self, in_features: int, num_classes: int, hidden: tuple[int, ...] = (256,)
    ) -> None:
        super().__init__()
        dims = [in_features, *hidden]
        layers: list[nn.Module] = [nn.Flatten()]
        for a, b in zip(dims[:-1], dims[1:], strict=True):
            layers += [nn.Linear(a, b), nn.ReLU()]
        layers.append(nn.Linear(dims[-1], num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class LogisticRegression(nn.Module):
    """Multinomial logistic regression: one linear layer on flattened inputs."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(in_features, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def build_model(
    name: str, input_shape: tuple[int, ...], num_classes: int, **kwargs: object
) -> nn.Module:
    """Build a model by name: ``tanh_cnn``, ``mlp``, ``logistic``, ``cifar_cnn``, ``wrn16_4``
    (:mod:`fedpriv.models.cifar`).

    Parameters
    ----------
    name : str
        Model name.
    input_shape : tuple of int
        Shape of one input without the batch dimension, e.g. ``(1, 28, 28)``.
    num_classes : int
        Number of output logits.

    Raises
    ------
    ConfigError
        For an unknown name or an input shape the model cannot take.
    """
    in_features = int(math.prod(input_shape))
    if name == "tanh_cnn":
        check(
            tuple(input_shape[-2:]) == (28, 28),
            "model",
            name,
            f"needs 28x28 image inputs; the dataset's records have shape {tuple(input_shape)} "
            "(model=logistic or mlp take any shape)",
        )
        return TanhCNN(num_classes, in_channels=input_shape[0])
    if name == "mlp":
        widths = kwargs.get("hidden", (256,))
        if not isinstance(widths, Iterable) or isinstance(widths, str):
            raise ConfigError("model.hidden", widths, "must be a list of layer widths")
        hidden = tuple(int(h) for h in widths)
        return MLP(in_features, num_classes, hidden)
    if name == "logistic":
        return LogisticRegression(in_features, num_classes)
    if name in ("cifar_cnn", "wrn16_4"):
        check(
            tuple(input_shape) == (3, 32, 32),
            "model",
            name,
            f"needs 3x32x32 image inputs (dataset=cifar10); the dataset's records have shape "
            f"{tuple(input_shape)} (model=logistic or mlp take any shape)",
        )
        return CifarCNN(num_classes) if name == "cifar_cnn" else WideResNet(16, 4, num_classes)
    check(False, "model.name", name, "must be one of: tanh_cnn, mlp, logistic, cifar_cnn, wrn16_4")
    raise AssertionError  # unreachable
