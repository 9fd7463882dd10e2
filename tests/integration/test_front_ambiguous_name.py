"""The front, asked for a model two deployments serve (their artifact, or its last part), says
that the name is ambiguous and names the deployments to address instead (400), rather than
"not served here"; a name nothing serves is still 404, and one deployment's artifact still
reaches it."""

from __future__ import annotations

from tests.fake_worker import FakeWorker
from tests.integration.test_front_proxy import Front, attached, config_for, scenario


def test_a_name_two_deployments_serve_is_ambiguous_and_names_them() -> None:
    async def go() -> None:
        one = await FakeWorker(model="fake-a").start()
        two = await FakeWorker(model="fake-b").start()
        three = await FakeWorker(model="fake-c").start()
        deployments = {
            "primary": attached(one, artifact="/models/all-MiniLM-L6-v2"),
            "remote": attached(two, artifact="all-MiniLM-L6-v2"),
            "judge": attached(three, artifact="/models/tiny-decision"),
        }
        async with Front(config_for(deployments)) as front:
            for name in deployments:
                await front.ready(name, 1)
            r = await front.post({"model": "all-MiniLM-L6-v2", "input": "hi"})
            error = r.json()["error"]
            assert r.status_code == 400 and error["code"] == "invalid_request", r.text
            assert "ambiguous" in error["message"] and "primary, remote" in error["message"], error
            assert "not served here" not in error["message"] and "judge" not in error["message"]

            r = await front.post({"model": "no-such-model", "input": "hi"})
            assert r.status_code == 404 and "not served here" in r.json()["error"]["message"], r.text
            r = await front.post({"model": "tiny-decision", "input": "hi"})  # its artifact's last part
            assert r.status_code == 200 and three.received[-1]["model"] == "fake-c", r.text
        for worker in (one, two, three):
            await worker.stop()

    scenario(go)
