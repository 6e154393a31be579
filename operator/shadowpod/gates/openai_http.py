"""The LLM judge's adapter: an OpenAI-compatible ``POST {base}/chat/completions``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import aiohttp

from shadowpod.gates.llm import JudgeUnavailable


class OpenAIChatModel:
    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> OpenAIChatModel:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def complete(self, messages: Sequence[dict[str, str]]) -> str:
        if self._http is None:
            self._http = aiohttp.ClientSession(headers=self._headers, timeout=self._timeout)
        body = {"model": self.model, "messages": list(messages), "temperature": 0}
        try:
            async with self._http.post(self.url, json=body) as response:
                text = await response.text()
                if response.status >= 400:
                    raise JudgeUnavailable(
                        f"the judge's endpoint {self.url} answered {response.status}: {text[:300]}"
                    )
                data: Any = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise JudgeUnavailable(
                f"the judge's endpoint {self.url} cannot be reached: {exc}"
            ) from exc
        try:
            content = data["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError) as exc:
            raise JudgeUnavailable(
                f"the judge's endpoint {self.url} gave no choices[0].message.content: "
                f"{str(data)[:300]}"
            ) from exc
        return str(content)
