from __future__ import annotations

import ductor


def test_public_face_names_its_version() -> None:
    assert ductor.__version__ == "0.1.0"
    assert "__version__" in ductor.__all__
