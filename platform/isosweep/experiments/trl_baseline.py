"""TRL's ``GRPOTrainer`` on isosweep's benchmark setting: the reference point of ``make bench``.

Run as a subprocess by :mod:`isosweep.experiments.side_by_side` (``trl`` is the ``bench`` extra,
not a runtime dependency of isosweep). Same base model files, same train problems in the same
order, same batch shape (``Bp`` prompts x ``n`` completions in one generation batch and one
optimizer step), completion length, sampling temperature, precision (fp32), learning rate, clip
range and KL coefficient (``beta``) as the isosweep trial it is compared with.
"""

from __future__ import annotations

import time

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from isosweep.tasks import get_task


class StepTimer(TrainerCallback):
    """Wall seconds of every optimizer step (generation, scoring, forwards, backward and update)."""

    def __init__(self):
        self.seconds: list[float] = []
        self._start = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds.append(time.perf_counter() - self._start)


def run_trl(setup, steps: int, out_dir: str) -> list[float]:
    """``steps`` GRPO steps of TRL on ``setup`` (a ``side_by_side.Setup``); the seconds of each step."""
    task = get_task(setup.task)
    problems = setup.step_problems(steps)
    data = Dataset.from_dict({"prompt": [p.prompt for p in problems], "index": list(range(len(problems)))})

    def reward(prompts, completions, index, **_):
        return [float(task.reward(problems[i], text)) for i, text in zip(index, completions)]

    tokenizer = AutoTokenizer.from_pretrained(setup.model_path)
    model = AutoModelForCausalLM.from_pretrained(setup.model_path, dtype=torch.float32)
    config = GRPOConfig(
        output_dir=out_dir, use_cpu=True, bf16=False, fp16=False, report_to=[], save_strategy="no",
        logging_strategy="no", max_steps=steps, seed=setup.seed, shuffle_dataset=False,
        per_device_train_batch_size=setup.Bp * setup.n, num_generations=setup.n, steps_per_generation=1,
        max_completion_length=setup.max_new_tokens, temperature=setup.temperature, top_p=1.0, top_k=0,
        learning_rate=setup.lr, lr_scheduler_type="constant", warmup_steps=0, adam_beta1=0.9, adam_beta2=0.99,
        weight_decay=0.0, max_grad_norm=setup.grad_clip, beta=setup.kl_coef, epsilon=setup.clip_low,
        epsilon_high=setup.clip_high, num_iterations=1, dataloader_num_workers=0, disable_dropout=True,
    )
    timer = StepTimer()
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=data,
                          processing_class=tokenizer, callbacks=[timer])
    trainer.train()
    return timer.seconds
