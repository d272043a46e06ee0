"""The composer ladder of a cold start, apart from its training loop (`lopd ladder`, and the end
of `lopd coldstart`): the rungs and their scoring (rungs), the four-way held-out check (heldout),
the free-vector control (h) (free_prompt), the task-only composer (h') (task_only) and the re-scoring of a finished run (rescore). It
imports nothing of the training loop (:mod:`stages.coldstart.recipe`) but the composer."""
