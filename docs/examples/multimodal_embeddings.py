"""Text, an image and a video in one /v1/embeddings request, with the official openai client.

    pip install -e '.[clients]'      # the openai client (not a dependency of the server)
    python docs/examples/multimodal_embeddings.py http://127.0.0.1:8100 MODEL

The image and the video (an animated GIF) are drawn here with pillow and sent as data: URLs.
"""

import base64
import io
import sys

import numpy as np
import openai
from PIL import Image, ImageDraw


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def red_square() -> str:
    image = Image.new("RGB", (96, 64), "white")
    ImageDraw.Draw(image).rectangle((20, 10, 76, 54), fill="red")
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return data_url(buf.getvalue(), "image/png")


def moving_dot() -> str:
    frames = []
    for i in range(8):
        frame = Image.new("RGB", (64, 64), "navy")
        ImageDraw.Draw(frame).ellipse((i * 6, 24, i * 6 + 16, 40), fill="yellow")
        frames.append(frame)
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:], duration=125)
    return data_url(buf.getvalue(), "image/gif")


base, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")
items = [
    "a red square",
    {"type": "image_url", "image_url": {"url": red_square()}},
    {"type": "video_url", "video_url": {"url": moving_dot()}},
]
got = client.embeddings.create(model=model, input=items, encoding_format="float")
vectors = np.array([d.embedding for d in got.data])
print(
    f"{vectors.shape[1]} dimensions; text·image {vectors[0] @ vectors[1]:+.3f}; text·video {vectors[0] @ vectors[2]:+.3f}"
)
