"""Planning manifests against the services of a real (embedded) store, as
`ductor serve --seed` does: the problems it finds before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from ductor_server.cli_server import seed
from ductor_server.settings import Settings


def test_a_secret_whose_env_names_no_variable_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "c.yaml").write_text(
        "kind: Connection\nspec:\n  name: crm\n  provider: http\n"
        "  config: {base_url: 'https://crm.example.com'}\n"
        "  secrets:\n    bearer_token: {env: ''}\n"
    )
    data = tmp_path / "data"
    data.mkdir()
    settings = Settings(data_dir=data, migrate_on_start=True)
    assert seed(settings, str(config), "acme") == 1
    assert capsys.readouterr().err.splitlines() == [
        f"error: {config}/c.yaml:7:19: /spec/secrets/bearer_token: 'env' must name an"
        " environment variable, got an empty string",
        f"seed {config}: 1 problem(s): nothing was applied",
    ]
