"""Compatibility workload: a Lightning Trainer fitting a torchvision ResNet-18 on random
images for a few steps (Lightning's own device set-up, torchvision's model, cuDNN).

  lightning_fit.py          result: the losses of the steps
"""

from __future__ import annotations

import compat_common as C


def work(argv: list[str]) -> dict:
    torch = C.torch_setup()
    import lightning as L
    import torchvision

    class Net(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = torchvision.models.resnet18(num_classes=10)
            self.losses: list[float] = []

        def training_step(self, batch, _idx):  # noqa: ANN001
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.model(x), y)
            self.losses.append(float(loss.detach()))
            return loss

        def configure_optimizers(self):  # noqa: ANN201
            return torch.optim.SGD(self.parameters(), lr=0.05)

    g = torch.Generator().manual_seed(4)
    data = torch.utils.data.TensorDataset(torch.randn(64, 3, 64, 64, generator=g),
                                          torch.randint(0, 10, (64,), generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    L.seed_everything(0, verbose=False)
    net = Net()
    trainer = L.Trainer(accelerator="gpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, deterministic=True)
    trainer.fit(net, loader)
    return {"ok": len(net.losses) == 8, "result": net.losses, "tol": 1e-4, **C.torch_info(torch)}


if __name__ == "__main__":
    C.main(work)
