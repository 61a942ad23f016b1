from __future__ import annotations

import ductor_settlement


def test_public_face_names_its_version() -> None:
    assert ductor_settlement.__version__ == "0.1.0"
    assert "__version__" in ductor_settlement.__all__
