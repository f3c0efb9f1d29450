"""What the pipeline computes and serves: embeddings and search over the chunks."""
