"""The paper's mechanisms in a controlled search world (docs/mechanisms.md): synthetic questions
with head and rare gold entities (``world``), a small policy trained with the project's own
rewards and advantages (``train``), and the paper's claims as paired effects over seeds
(``claims``). numpy and the method core only; no language model, no framework."""
