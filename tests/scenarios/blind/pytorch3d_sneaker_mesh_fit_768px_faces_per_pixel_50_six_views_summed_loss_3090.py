"""fit_sneaker.py -- an e-commerce 3D team turns turntable photos of products into textured meshes.  The
prototype is PyTorch3D's tutorial "Fit a mesh via rendering" (deform an ico-sphere and learn per-vertex
colours against multi-view photos), scaled up from the tutorial's cow: 24 studio photos of a sneaker per
product, downsampled to 768 x 768 (the tutorial renders 128 x 128), ico_sphere(6) as the source mesh (40,962
vertices, 81,920 faces; the tutorial's level 4 "was too blobby"), 6 views per iteration (the tutorial's 2
"converged too slowly").  PyTorch3D 0.7.6, PyTorch 2.1, one RTX 3090 (24 GB).  The rendering setup is the
tutorial's, with the new size:

    sigma = 1e-4
    raster_settings_soft = RasterizationSettings(image_size=768,
                                                 blur_radius=np.log(1. / 1e-4 - 1.) * sigma,
                                                 faces_per_pixel=50, perspective_correct=False)
    renderer_textured = MeshRenderer(rasterizer=MeshRasterizer(cameras=camera, raster_settings=raster_settings_soft),
                                     shader=SoftPhongShader(device=device, cameras=camera, lights=lights))
    optimizer = torch.optim.SGD([deform_verts, sphere_verts_rgb], lr=1.0, momentum=0.9)
    for i in range(Niter):
        optimizer.zero_grad()
        new_src_mesh = src_mesh.offset_verts(deform_verts)
        new_src_mesh.textures = TexturesVertex(verts_features=sphere_verts_rgb)
        loss = {k: torch.tensor(0.0, device=device) for k in losses}
        update_mesh_shape_prior_losses(new_src_mesh, loss)
        for j in np.random.permutation(num_views).tolist()[:num_views_per_iteration]:
            images_predicted = renderer_textured(new_src_mesh, cameras=target_cameras[j], lights=lights)
            loss_silhouette = ((images_predicted[..., 3] - target_silhouette[j]) ** 2).mean()
            loss["silhouette"] += loss_silhouette / num_views_per_iteration
            loss_rgb = ((images_predicted[..., :3] - target_rgb[j]) ** 2).mean()
            loss["rgb"] += loss_rgb / num_views_per_iteration
        sum_loss = sum(l * losses[k]["weight"] for k, l in loss.items())
        sum_loss.backward()
        optimizer.step()

The very first iteration dies with CUDA out of memory in the renderer (SoftPhongShader's lighting), while
rendering its 4th view.

Where the memory goes: the soft rasterizer keeps faces_per_pixel = 50 candidate faces for EVERY pixel, and
the Phong shader and the softmax blend work on all of them: per view 768 x 768 x 50 = 29.5M pixel-face
samples -- the fragments (face index int64, depth, barycentrics, distances: 0.8 GiB) and a dozen
(H, W, K, 3) float32 tensors of 0.33 GiB each (texels, interpolated positions and normals, light and view
directions, reflections, diffuse, specular, colours...) that autograd keeps for backward: ~6.3 GiB per
view.  The tutorial's loop adds each view's loss into one sum and calls backward once, so all six views'
graphs are alive together (38 GiB); the 4th does not fit (a 338 MiB request with 19.1 GiB held by the
first three views' graphs).  At the tutorial's 128 px and 2 views it was 0.35 GiB.

An expert: (1) call backward per view (or per small group of views) -- the gradients accumulate in
deform_verts.grad exactly as with the sum, and only one view's graph is alive; (2) faces_per_pixel=50 at
768 px is the multiplier: with blur_radius ~9e-4 (a third of a pixel at this size) a handful of faces per
pixel carries all the weight -- 4 to 8 is enough; (3) render at lower resolution for the early, coarse
iterations (coarse to fine) or fewer views per iteration.  Wrong first advice: expandable_segments or
empty_cache (every tensor is live in the graph), inference_mode (this is an optimisation: the gradients
are the point), mixed precision (PyTorch3D's rasterizer and shaders run in float32), quantization (the
"model" is 0.9 MB of vertex offsets and colours), a bigger GPU.
"""
import math
import sys

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

F32, I64 = 4, 8
MiB, GiB = 1 << 20, 1 << 30
IMAGE_SIZE, FACES_PER_PIXEL = 768, 50
NUM_VIEWS, NUM_VIEWS_PER_ITERATION = 24, 6
N_VERTS, N_FACES = 40_962, 81_920


def _new(shape, *inputs, itemsize=F32):
    out = torch.empty(math.prod(shape) * itemsize, device="cuda")
    out.shape = tuple(shape)
    if torch.is_grad_enabled():
        out._saved = inputs
    return torch._derive(out, *inputs)


def _param(shape):
    p = nn.Parameter(torch.empty(math.prod(shape) * F32, device="cuda"))
    p.shape = tuple(shape)
    return p


# ---- pytorch3d, as far as the tutorial uses it (plain-Python mirror: sizes only) ----
class Meshes(object):
    def __init__(self, verts, faces, textures=None):
        self.verts, self.faces, self.textures = verts, faces, textures

    def offset_verts(self, vert_offsets):
        return Meshes(_new(self.verts.shape, self.verts, vert_offsets), self.faces)

    def verts_normals_packed(self):
        return _new(self.verts.shape, self.verts, self.faces)

    def faces_verts(self, attr):
        return _new((N_FACES, 3, 3), attr, self.faces)                     # attr[faces]


class TexturesVertex(object):
    def __init__(self, verts_features):
        self.verts_features = verts_features

    def sample_textures(self, fragments, meshes):
        return interpolate_face_attributes(fragments.pix_to_face, fragments.bary_coords,
                                           meshes.faces_verts(self.verts_features))


class RasterizationSettings(object):
    def __init__(self, image_size=256, blur_radius=0.0, faces_per_pixel=1, perspective_correct=None):
        self.image_size, self.blur_radius, self.faces_per_pixel = image_size, blur_radius, faces_per_pixel


class Fragments(object):
    def __init__(self, pix_to_face, zbuf, bary_coords, dists):
        self.pix_to_face, self.zbuf, self.bary_coords, self.dists = pix_to_face, zbuf, bary_coords, dists


class MeshRasterizer(nn.Module):
    def __init__(self, cameras=None, raster_settings=None):
        nn.Module.__init__(self)
        self.raster_settings = raster_settings

    def forward(self, meshes, cameras=None):
        s = self.raster_settings
        hwk = (1, s.image_size, s.image_size, s.faces_per_pixel)
        with torch.no_grad():
            pix_to_face = _new(hwk, itemsize=I64)
        zbuf = _new(hwk, meshes.verts)
        bary = _new(hwk + (3,), meshes.verts)
        dists = _new(hwk, meshes.verts)
        return Fragments(pix_to_face, zbuf, bary, dists)


def interpolate_face_attributes(pix_to_face, barycentric_coords, face_attributes):
    """the fused CUDA kernel: one (N, H, W, K, D) output, inputs saved for backward"""
    return _new(pix_to_face.shape + (face_attributes.shape[-1],), barycentric_coords, face_attributes)


def _normalize(v):
    norm = _new(v.shape[:-1], v)
    return _new(v.shape, v, norm)


def _apply_lighting(points, normals, camera_position):
    # PointLights.diffuse
    direction = _normalize(_new(points.shape, points))                    # location - points
    angle = _new(points.shape[:-1], normals, direction)                   # relu((normals * direction).sum(-1))
    diffuse = _new(points.shape, angle)                                   # color * angle[..., None]
    # PointLights.specular
    view_direction = _normalize(_new(points.shape, points))               # camera_position - points
    cos_angle = _new(points.shape[:-1], normals, direction)
    reflect_direction = _new(points.shape, direction, _new(points.shape, cos_angle, normals))
    alpha = _new(points.shape[:-1], view_direction, reflect_direction)    # relu(dot) ** shininess
    specular = _new(points.shape, alpha)
    return diffuse, specular


def phong_shading(meshes, fragments, texels, cameras):
    faces_verts = meshes.faces_verts(meshes.verts)
    faces_normals = meshes.faces_verts(meshes.verts_normals_packed())
    pixel_coords = interpolate_face_attributes(fragments.pix_to_face, fragments.bary_coords, faces_verts)
    pixel_normals = interpolate_face_attributes(fragments.pix_to_face, fragments.bary_coords, faces_normals)
    diffuse, specular = _apply_lighting(pixel_coords, pixel_normals, cameras)
    return _new(texels.shape, _new(texels.shape, diffuse, texels), specular)   # (ambient + diffuse) * texels + specular


def softmax_rgb_blend(colors, fragments, sigma=1e-4, gamma=1e-4):
    shape_k = fragments.dists.shape
    prob_map = _new(shape_k, _new(shape_k, fragments.dists))               # sigmoid(-dists / sigma) * mask
    alpha = _new(shape_k[:-1], prob_map)                                   # prod(1 - prob_map)
    z_inv = _new(shape_k, fragments.zbuf)                                  # (zfar - zbuf) / (zfar - znear) * mask
    z_inv_max = _new(shape_k[:-1], z_inv)
    weights_num = _new(shape_k, prob_map, _new(shape_k, z_inv, z_inv_max))  # prob_map * exp((z_inv - max) / gamma)
    weighted_colors = _new(shape_k[:-1] + (3,), _new(colors.shape, weights_num, colors))
    return _new(shape_k[:-1] + (4,), weighted_colors, alpha)


class SoftPhongShader(nn.Module):
    def forward(self, fragments, meshes, cameras=None):
        texels = meshes.textures.sample_textures(fragments, meshes)
        colors = phong_shading(meshes, fragments, texels, cameras)
        return softmax_rgb_blend(colors, fragments)


class MeshRenderer(nn.Module):
    def __init__(self, rasterizer, shader):
        nn.Module.__init__(self)
        self.rasterizer, self.shader = rasterizer, shader

    def forward(self, meshes_world, cameras=None, lights=None):
        fragments = self.rasterizer(meshes_world, cameras=cameras)
        return self.shader(fragments, meshes_world, cameras=cameras)


def ico_sphere(level):
    return Meshes(_new((N_VERTS, 3)), _new((N_FACES, 3), itemsize=I64))


# ---- the fitting script ----
with torch.no_grad():
    target_rgb = [_new((1, IMAGE_SIZE, IMAGE_SIZE, 3)) for _ in range(NUM_VIEWS)]
    target_silhouette = [_new((1, IMAGE_SIZE, IMAGE_SIZE)) for _ in range(NUM_VIEWS)]
    src_mesh = ico_sphere(6)
target_cameras = list(range(NUM_VIEWS))

sigma = 1e-4
raster_settings_soft = RasterizationSettings(image_size=IMAGE_SIZE, blur_radius=math.log(1. / 1e-4 - 1.) * sigma,
                                             faces_per_pixel=FACES_PER_PIXEL, perspective_correct=False)
renderer_textured = MeshRenderer(rasterizer=MeshRasterizer(raster_settings=raster_settings_soft),
                                 shader=SoftPhongShader())
deform_verts = _param((N_VERTS, 3))
sphere_verts_rgb = _param((1, N_VERTS, 3))
optimizer = torch.optim.SGD([deform_verts, sphere_verts_rgb], lr=1.0, momentum=0.9)
order = [17, 3, 22, 9, 14, 0, 6, 11]

try:
    for i in range(2000):
        optimizer.zero_grad()
        new_src_mesh = src_mesh.offset_verts(deform_verts)
        new_src_mesh.textures = TexturesVertex(verts_features=sphere_verts_rgb)
        loss_sil = loss_rgb = _new((1,), new_src_mesh.verts)                  # + edge, normal, laplacian priors
        for n, j in enumerate(order[:NUM_VIEWS_PER_ITERATION]):
            images_predicted = renderer_textured(new_src_mesh, cameras=target_cameras[j])
            loss_sil = _new((1,), loss_sil, images_predicted, target_silhouette[j])
            loss_rgb = _new((1,), loss_rgb, images_predicted, target_rgb[j])
            print("iter %d view %d rendered, allocated %.1f GiB" % (i, n + 1, torch.cuda.memory_allocated() / GiB))
        sum_loss = _new((1,), loss_sil, loss_rgb)
        sum_loss.backward()
        optimizer.step()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
