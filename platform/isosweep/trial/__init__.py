"""One GRPO trial: its directory on disk (``files``), the DeepSpeed learner (``learner``), the training
loop (``loop``) and the Ray Train job that runs it (``job``)."""
