"""The Calc env against the real bubblewrap sandbox (no fake at the seam)."""

import anyio
import pytest
from tests.envs.envfakes import ROW

from agentrl.envs.calc import CalcEnv


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_calc_with_real_bubblewrap_sandbox(backend: str) -> None:
    from agentrl.sandbox import create_sandbox

    async def main() -> None:
        sandbox = create_sandbox("bubblewrap")
        try:
            env = CalcEnv(sandbox=sandbox)
            env.reset(options={"row": dict(ROW)})
            obs, reward, terminated, truncated, info = await env.astep("<code>print(347*58+91)</code>")
            assert obs == [{"role": "tool", "content": "<interpreter>\n20217\n</interpreter>"}]
            assert (reward, terminated, truncated, info["status"], info["tool_errors"]) == (0.0, False, False, "ok", 0)
            obs, reward, terminated, *_ = await env.astep("The answer is \\boxed{20217}.")
            assert (obs, reward, terminated) == ([], 1.0, True)
        finally:
            await sandbox.aclose()

    anyio.run(main, backend=backend)
