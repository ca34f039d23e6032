"""SCodeR (Li et al., 2022): soft-labeled contrastive training with discriminators.

``discriminator`` holds the cross-encoders D_φ / D_ψ, ``examples`` the listwise examples
(a query, its positive and sampled hard negatives), ``loops`` the Ray Train per-worker
loops of the discriminator and dual-encoder stages, ``soft_labels`` the offline scoring
with Ray Data; ``ray_jobs.scoder`` runs Algorithm 2 with them.
"""
