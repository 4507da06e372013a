"""Two training histories for the ``analyze`` tests, fed to verl's and TRL's own loggers (the log files are
written by those classes, never typed by hand).

Both rise as r_s = 0.2 + 0.6·(1 − e^(−s/30)) + noise (σ = 0.02, seeded) over steps s = 1 … 150, with a KL of 0.01
and a gradient norm of 0.5 (each × (1 + 0.1·noise)):

- ``healthy`` keeps rising; one isolated gradient-norm spike (× 20 at step 60) is not followed by any drop, so the
  detector must not fire;
- ``collapsing`` prospers the same way until step 90, where the KL and the gradient norm spike (× 20) and the
  reward then decays, r_s = r_90 · e^(−(s − 90)/5): "prosperity before collapse".  The smoothed reward gives back
  half its gain well within 20 steps of the spike, so the detector must fire between steps 90 and 110.
"""

from __future__ import annotations

import numpy as np

STEPS = np.arange(1, 151)
SPIKE_STEP = 90


def history(kind: str) -> list[dict[str, float]]:
    """One dict per step: reward, kl, grad_norm, entropy, clip_frac (our names; the tests rename them)."""
    gen = np.random.default_rng(0 if kind == "healthy" else 1)
    noise = gen.standard_normal((4, STEPS.size))
    reward = 0.2 + 0.6 * (1.0 - np.exp(-STEPS / 30.0)) + 0.02 * noise[0]
    kl = 0.01 * (1.0 + 0.1 * noise[1])
    grad = 0.5 * (1.0 + 0.1 * noise[2])
    if kind == "healthy":
        grad[STEPS == 60] *= 20.0
    elif kind == "collapsing":
        at = int(np.flatnonzero(STEPS == SPIKE_STEP)[0])
        reward[at + 1:] = reward[at] * np.exp(-(STEPS[at + 1:] - SPIKE_STEP) / 5.0)
        kl[at] *= 20.0
        grad[at] *= 20.0
    else:
        raise ValueError(kind)
    entropy = 1.0 - 0.002 * STEPS
    clip = 0.001 + 0.0005 * np.abs(noise[3])
    return [{"step": int(s), "reward": float(r), "kl": float(k), "grad_norm": float(g), "entropy": float(h),
             "clip_frac": float(c)} for s, r, k, g, h, c in zip(STEPS, reward, kl, grad, entropy, clip, strict=True)]


#: our names → verl's (FileLogger / its TensorBoard adapter) and TRL's (GRPOTrainer._metrics / Trainer.log)
VERL_NAMES = {"reward": "critic/score/mean", "kl": "actor/ppo_kl", "grad_norm": "actor/grad_norm",
              "entropy": "actor/entropy", "clip_frac": "actor/pg_clipfrac"}
TRL_NAMES = {"reward": "reward", "kl": "kl", "grad_norm": "grad_norm", "entropy": "entropy",
             "clip_frac": "clip_ratio/region_mean"}
