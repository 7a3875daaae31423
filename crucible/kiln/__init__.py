"""Notes on disk: parsing, safe paths, atomic writes, chunking, embedder, Chroma index, watcher."""
