"""SCodeR (Li et al., 2022): soft-labeled contrastive training with discriminators.

``discriminator`` holds the cross-encoders D_φ / D_ψ, ``examples`` the listwise examples
(a query, its positive and sampled hard negatives), ``objectives`` what the discriminator
and dual-encoder stages train in santa's one worker loop (:mod:`santa.train.loop`),
``soft_labels`` the offline scoring with Ray Data, and ``algorithm`` Algorithm 2 with
them (``ray_jobs.scoder`` is its command line).
"""
