"""Real photographs that ship inside PyPI wheels, so data tests and benchmarks need no download."""

from __future__ import annotations

from dataclasses import dataclass

from PIL import Image


@dataclass(frozen=True)
class Photo:
    """One redistributable photograph with its caption and licence."""

    name: str
    """Stable identifier, also used in file names and sample ids."""
    loader: str
    """Where the pixels come from: `skimage.data:<fn>` or `matplotlib:<sample file>`."""
    caption: str
    """Human-written sentence describing the photo (used as the reference answer)."""
    license: str
    """Licence as stated by the shipping package (all entries allow redistribution)."""


_SKIMAGE_CC0 = "CC0 1.0 (scikit-image docstring: 'No copyright restrictions. CC0 by the photographer')"
_SKIMAGE_PD = "Public domain (scikit-image docstring: 'No known copyright restrictions')"

# Only loaders whose scikit-image docstring states CC0, public domain or no known copyright restrictions.
# Left out: moon, page, colorwheel, logo, stereo_motorcycle (no licence stated); horse (clip-art
# silhouette, not a photo); microaneurysms (102x102 px).
_SKIMAGE: tuple[Photo, ...] = (
    Photo(
        "astronaut",
        "skimage.data:astronaut",
        "Colour portrait of the astronaut Eileen Collins in an orange flight suit, next to a flag and a "
        "model of the space shuttle.",
        "Public domain (NASA Great Images; scikit-image docstring: 'No known copyright restrictions, "
        "released into the public domain')",
    ),
    Photo(
        "coffee",
        "skimage.data:coffee",
        "A cup of espresso on a red saucer with a spoon, standing on a wooden table.",
        _SKIMAGE_CC0 + " - Rachel Michetti, courtesy of Pikolo Espresso Bar",
    ),
    Photo(
        "chelsea",
        "skimage.data:chelsea",
        "Close-up of Chelsea the tabby cat looking at the camera with green eyes.",
        _SKIMAGE_CC0 + " - Stefan van der Walt",
    ),
    Photo(
        "rocket",
        "skimage.data:rocket",
        "A SpaceX Falcon 9 rocket carrying DSCOVR on the launch pad at dusk, between lightning towers.",
        "Public domain (released by SpaceX; scikit-image docstring)",
    ),
    Photo(
        "hubble_deep_field",
        "skimage.data:hubble_deep_field",
        "The Hubble eXtreme Deep Field: thousands of faint, colourful distant galaxies on a black sky.",
        "Public domain (NASA; scikit-image docstring: 'may be freely used in the public domain')",
    ),
    Photo(
        "retina",
        "skimage.data:retina",
        "A fundus photograph of a healthy human retina, with blood vessels spreading from the optic disc.",
        "CC0 1.0 (Mikael Haggstrom, Wikimedia Commons; scikit-image docstring)",
    ),
    Photo(
        "immunohistochemistry",
        "skimage.data:immunohistochemistry",
        "Microscope image of colonic glands stained brown by immunohistochemistry with a blue hematoxylin "
        "counterstain.",
        _SKIMAGE_PD + " - Center for Microscopy And Molecular Imaging",
    ),
    Photo(
        "camera",
        "skimage.data:camera",
        "Black-and-white photo of a man in a dark coat filming with a camera on a tripod in an open field.",
        _SKIMAGE_CC0 + " - Lav Varshney",
    ),
    Photo(
        "coins",
        "skimage.data:coins",
        "Twenty-four ancient Greek coins from Pompeii laid out in rows on a dark background.",
        _SKIMAGE_PD + " - Brooklyn Museum Collection",
    ),
    Photo(
        "clock",
        "skimage.data:clock",
        "A wall clock photographed while the camera moved sideways, so it is blurred horizontally.",
        "Public domain (released by the photographer, Stefan van der Walt; scikit-image docstring)",
    ),
    Photo(
        "text",
        "skimage.data:text",
        "Handwritten mathematical formulas on a sheet of paper, photographed at an angle.",
        "Public domain (Wikipedia File:Corner.png; scikit-image docstring: 'No known copyright restrictions')",
    ),
    Photo(
        "brick",
        "skimage.data:brick",
        "Grey brick wall with long rectangular bricks laid in a running bond pattern.",
        "CC0 1.0 (CC0Textures Bricks25; scikit-image docstring)",
    ),
    Photo(
        "grass",
        "skimage.data:grass",
        "Black-and-white close-up of a patch of grass and small leaves.",
        "CC0 1.0 (DeviantArt linolafett Grass-01; scikit-image docstring)",
    ),
    Photo(
        "gravel",
        "skimage.data:gravel",
        "Black-and-white close-up of a bed of small gravel stones.",
        "CC0 1.0 (CC0Textures Gravel04; scikit-image docstring)",
    ),
    Photo(
        "cell",
        "skimage.data:cell",
        "Quantitative phase microscope image of a single round cell floating in saline.",
        "CC0 1.0 (Paul Mueller et al.; scikit-image docstring: 'This image is CC0')",
    ),
)

_MATPLOTLIB: tuple[Photo, ...] = (
    Photo(
        "grace_hopper",
        "matplotlib:grace_hopper.jpg",
        "Official portrait of Rear Admiral Grace Hopper in U.S. Navy uniform and cap, in front of flags.",
        "Public domain (U.S. Navy photograph, work of the U.S. federal government)",
    ),
)

#: Every photo of the sample and realistic datasets. The same on every machine (scikit-learn's two CC BY photos
#: are left out: a dataset that changed with an optional package would make runs incomparable).
PHOTOS: tuple[Photo, ...] = _SKIMAGE + _MATPLOTLIB


def load_photo(photo: Photo) -> Image.Image:
    """Load a photo's pixels from its shipping package as an RGB image (grey photos get 3 equal channels)."""
    package, _, item = photo.loader.partition(":")
    if package == "skimage.data":
        import skimage.data

        image = Image.fromarray(getattr(skimage.data, item)())
    elif package == "matplotlib":
        from matplotlib import cbook

        with Image.open(cbook.get_sample_data(item, asfileobj=False)) as opened:
            image = opened.copy()
    else:
        raise ValueError(f"Unknown photo loader {photo.loader!r}")
    return image.convert("RGB")
