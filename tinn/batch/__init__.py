"""What one call carries, below every component: the ``Batch`` value one call carries, what kind a batch is, its
checks and the seams back to the caller's kind (``batch``), the operations of each kind side by side (``ops``:
``HOST`` for numpy, ``DEVICE`` for ``ti.ndarray``), device buffers (``buffers``), how a batch spreads over a network
array, its host row blocks included (``routing``), the device census of a step (``census``), a bad batch reported
(``faults``), a batch's loss per network (``loss_value``) and the moves between a user's fields and batches (``fields``). Imports only ``tinn.runtime``."""
