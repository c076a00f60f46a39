"""Embeddings: the models, computing them, their files and PCA."""
