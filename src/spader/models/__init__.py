"""Models as files: hub downloads (:mod:`.hub`) and what a local model directory is (:mod:`.local`).

The tiny random models of the demo and the tests are built by :mod:`spader.demo.tiny`.
"""
