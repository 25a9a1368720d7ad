"""Baselines that are not federated algorithms: `centralized.train_centralized`, a model trained on the pooled data
on the server (early stopping on validation, the best epoch's weights, resumable epoch checkpoints), the "Server"
rows of the papers' tables.

It sits beside `fedpersonal.algorithms`, not in it: it builds no `PersonalizedProcess` and uses the program layer's
stop signals (`fedpersonal.program.stop_signals`).
"""
